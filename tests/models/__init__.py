"""Model folders: loading, the checks a broken folder gets, precision and quantized encoders."""
