"""The cute backend: CuTe DSL kernels, their ahead-of-time build, and how they are loaded."""
