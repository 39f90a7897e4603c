"""Reads a page chromium dumped (--dump-dom) as the console's tests check
it: the rows of each <tbody id=...> as lists of cell texts, and the
<dt>/<dd> pairs of the key view. Usage: page.py FILE; prints JSON
{"tables": {id: [[cell, ...], ...]}, "terms": {dt: dd}}."""
import html.parser
import json
import sys


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables, self.terms = {}, {}
        self.body = self.row = self.cell = None
        self.tag = self.term = None

    def handle_starttag(self, tag, attrs):
        self.tag = tag
        if tag == "tbody":
            self.body = self.tables.setdefault(dict(attrs).get("id"), [])
        elif tag == "tr" and self.body is not None:
            self.row = []
            self.body.append(self.row)
        elif tag == "td" and self.row is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.body = None
        elif tag == "td" and self.cell is not None:
            self.row.append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data
        elif self.tag == "dt":
            self.term = data
            self.terms[data] = ""
        elif self.tag == "dd" and self.term is not None:
            self.terms[self.term] += data


page = Page()
with open(sys.argv[1], encoding="utf-8") as f:
    page.feed(f.read())
print(json.dumps({"tables": page.tables, "terms": page.terms}))
