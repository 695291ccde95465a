"""specdec's own CPU kernels (a torch C++ extension built at first use): see build.py and linear.py."""
