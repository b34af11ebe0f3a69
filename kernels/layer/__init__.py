"""Tagging layers, validating kernel layers and kernelizing models."""
