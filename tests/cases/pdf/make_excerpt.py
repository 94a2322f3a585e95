"""debian-reference-excerpt.pdf: seven pages of the Debian Reference (title, two pages of its contents, the first
four pages of chapter 1) and a one-page back-of-book index in the book's style, written with fpdf2 from its terms.
Run from this folder: python make_excerpt.py (needs pypdfium2 and fpdf2, and the shared corpora)."""
from pathlib import Path

import pypdfium2 as pdfium
from fpdf import FPDF

terms = [("A", [("account, root", "2, 3"), ("adduser", "2"), ("apt-get", "1"), ("aptitude", "1")]),
         ("C", [("console", "1, 2"), ("character terminal", "1"), ("chsh", "4")]),
         ("G", [("GUI system administration tools", "3"), ("gnome-terminal", "2")]),
         ("L", [("login prompt", "1, 3"), ("logout", "2, 4")]),
         ("P", [("passwd", "2"), ("password, root", "2-3"), ("power off", "4")]),
         ("R", [("root shell prompt", "3"), ("root account", "2")]),
         ("S", [("shell prompt", "1, 2"), ("shutdown", "4"), ("su", "3"), ("sudo", "3"), ("sync", "4")]),
         ("T", [("terminal emulator", "2"), ("tty", "1")]),
         ("U", [("user account", "2"), ("user shell prompt", "3")]),
         ("X", [("X Window System", "2"), ("xterm", "2")])]
pdf = FPDF(format="A4")
pdf.set_auto_page_break(True, margin=20)
pdf.add_page()
pdf.set_font("Helvetica", size=9)
pdf.cell(0, 6, "Debian Reference 232 / 233", new_x="LMARGIN", new_y="NEXT")
pdf.set_font("Helvetica", "B", size=20)
pdf.cell(0, 14, "Index", new_x="LMARGIN", new_y="NEXT")
for letter, entries in terms:
    pdf.set_font("Helvetica", "B", size=11)
    pdf.cell(0, 8, letter, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=10)
    for term, pages in entries:
        pdf.cell(0, 5.5, f"{term}, {pages}", new_x="LMARGIN", new_y="NEXT")
pdf.output("/tmp/index.pdf")

src = pdfium.PdfDocument(Path(__file__).resolve().parents[3].parent / "shared/corpora/mixed/pdf/debian-reference.en.pdf")
out = pdfium.PdfDocument.new()
out.import_pages(src, [1, 4, 5, 28, 29, 30, 31])
out.import_pages(pdfium.PdfDocument("/tmp/index.pdf"))
out.save(Path(__file__).with_name("debian-reference-excerpt.pdf"))
print(len(out))
