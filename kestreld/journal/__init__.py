"""The durable journal: libkestrel's writer segments and reader checkpoints."""
