"""Images: decoding, Spark image jobs, classification and OCR."""
