"""The draft worker: drafts for many sequences and streams draft trees to the targets that own them."""
