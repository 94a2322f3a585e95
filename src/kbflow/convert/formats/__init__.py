"""One conversion path per format: PDF (PDFium + OCR), images (OCR), audio (speech recognition), HTML, text and
code; ``kbflow.convert.converters`` picks the path by file name."""
