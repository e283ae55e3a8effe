"""What runs inside the training container: the node agent (agent/), the SDK a training loop imports (sdk/),
and the built-in FSDP2 trainer with its NVRx integration (train.py and the modules beside it).

Imports nothing from api/, workers/ or ftplane/: the agent's HTTP reports are the only contract with the
control plane, and the ranks talk only to their node's agent.
"""
