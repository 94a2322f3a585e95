"""The input formats, one module each (PDF through PDFium with OCR, images by OCR, audio by speech recognition,
HTML, Office and EPUB through MarkItDown, text, CSV and code): each declares ``FORMATS`` (``base.Format``), and
``registry`` collects them with the installed plugins'. ``kbflow.convert.converters`` converts a file by the
format the registry names for it."""
