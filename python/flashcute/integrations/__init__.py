"""Integrations of flashcute into other libraries' attention call sites.

``flashcute.integrations.transformers``: ``attn_implementation="flashcute"`` for Hugging Face
transformers models. Each integration imports its library only when it is used.
"""
