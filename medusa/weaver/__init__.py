"""Weaving (Weaver, ATC'25): a hot model offloads the attention of part of its decode batch, with
that KV, to a worker of a cold model, which runs it between its own kernels."""
