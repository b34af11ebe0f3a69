"""Modes, devices and capability ranges, the kernel mapping registry, and resolution."""
