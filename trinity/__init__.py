"""trinity: reinforcement fine-tuning of language models (explorer, buffer, trainer, synchronizer)."""

__version__ = "0.1.0"
