from transformer_lab.cli import app

app()
