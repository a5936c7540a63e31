"""heterps: plan DNN training on heterogeneous, priced resources."""

__version__ = "0.1.0"
