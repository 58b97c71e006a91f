"""C++ kernels for the CPU: plain C++ with OpenMP, no torch headers, built by g++ on first use."""
