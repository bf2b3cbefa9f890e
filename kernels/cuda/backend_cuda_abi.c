/* backend_cuda_abi.c: the size of the backend table this object was built
 * with. The loader (kernels/backend.c) refuses a libskv-cuda.so whose table
 * is not the executable's own layout (an object left from another build). */
#include "backend.h"

const size_t skv_backend_cuda_table_size = sizeof(skv_backend);
