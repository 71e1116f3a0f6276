/*
 * config_default.c — igrad_config_default: IGRAD_CONFIG_INIT as a function,
 * so that bindings which cannot expand a C macro (the Python package reads
 * it through ctypes) take every default of igrad_config_t from the one place
 * that defines it; and igrad_ig_default_target_ratio, the payload target
 * that method ig gets when its user gives none (the trainer's --target-ratio
 * and the Python binding's IgradState).
 */
#include "core/internal.h"

igrad_status_t igrad_config_default(igrad_config_t *out, size_t size)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_config_default: out is NULL");
    IGRAD_FAIL_IF(size != sizeof(igrad_config_t), IGRAD_E_INVALID,
                  "igrad_config_default: the caller's igrad_config_t is %zu bytes, this "
                  "library's %zu (a binding made for another version of igrad.h)",
                  size, sizeof(igrad_config_t));
    const igrad_config_t init = IGRAD_CONFIG_INIT;
    *out = init;
    return IGRAD_OK;
}

double igrad_ig_default_target_ratio(void)
{
    return 0.25;
}
