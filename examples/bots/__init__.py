"""BOTS (Trinity-RFT's examples/bots): the math workflows its configs name by dotted path."""
