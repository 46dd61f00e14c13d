"""Job configuration: parsing, validation, defaults and the errors a wrong setting gets."""
