/* A fixture of check_layers.py: core including an engine header, which
 * the check must refuse (CTest layers_refuses_upward, WILL_FAIL). */
#include "engine/engine.h"
