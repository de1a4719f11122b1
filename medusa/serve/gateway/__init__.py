"""The serverless gateway: a model catalog scaled from zero onto device slices."""
