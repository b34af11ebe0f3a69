"""Where kernel code comes from: repository kinds, build variants and importing packages."""
