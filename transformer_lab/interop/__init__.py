"""Interoperation with other libraries (Hugging Face ``transformers``: ``interop.hf``)."""
