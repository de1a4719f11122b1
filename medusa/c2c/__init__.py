"""Superchip serving: HybridGEMM over host-resident weights, its performance model, the C2C-aware
scheduler (placement, prefill chunks, the alpha controller) and a simulator."""
