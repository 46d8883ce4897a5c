// augment.cu compiled by the host compiler for the CPU emulation (sim.h is force-included).
#include "backends/cuda/augment.cu"
