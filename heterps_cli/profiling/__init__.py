"""Reading models and measuring their layers: the zoo, one-process and many-process measurement, profile files."""
