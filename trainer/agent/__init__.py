"""The node agent: one per node (a pod on Kubernetes, a process per node on the local backend).

It starts ft_launcher with the job's command and owns the node's conversation with the control
plane; see node.py. Standard library plus httpx (and nvidia-ml-py where present): it runs in the
user's training image.
"""
