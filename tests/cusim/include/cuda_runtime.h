/* cuda_runtime.h for the CUDA simulator (tests/cusim): the runtime API and
 * the language, from cusim.h. */
#ifndef SKV_CUSIM_CUDA_RUNTIME_H
#define SKV_CUSIM_CUDA_RUNTIME_H
#include "../cusim.h"
#endif
