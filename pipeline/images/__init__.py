"""Image cores for the image tasks: decoding untrusted bytes, geometry, OCR pre/post-processing.

Pure Pillow/numpy (scipy for connected components); no torch, onnxruntime or
pyspark at import time.
"""
