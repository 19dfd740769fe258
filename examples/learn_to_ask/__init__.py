"""Learn2Ask (Trinity-RFT's examples/learn_to_ask): the workflow its config names by dotted path."""
