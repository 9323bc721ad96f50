// Stands in for the CUDA header of the same name in the CPU emulation (cuda_emulation.h).
#include "cuda_emulation.h"
