"""Where a document is born: scan sources (``scan``, ZIP members via ``archive``), convert each file to Markdown
(``converters``, one path per format in ``formats/``), cache conversions per document (``cache``), run them in
worker processes (``pool``), or write them to a folder (``to_folder``, ``kbflow convert``)."""
