/* A library that imports neither cudaMalloc nor cudaFree. */
int fake_other(int x) { return x + 1; }
