"""How a kernel touches memory, as simcuda's access records and the PTX instrumentation say it:
bit flags, READ | WRITE for both."""

READ, WRITE = 1, 2
