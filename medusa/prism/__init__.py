"""Prism: several models share a device's memory elastically, scheduled for their SLOs (seed:
"Prism: Unleashing GPU Sharing for Cost-Efficient Multi-LLM Serving"). The page ledger shared by
the workers on one device, the gateway's two algorithms (KV-pressure placement across devices,
Moore-Hodgson ordering of one device's queue) and the sharing simulator."""
