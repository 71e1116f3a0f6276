/* A fixture of check_layers.py (see ../core/common.h). */
#include "core/common.h"
