"""What made gloo-peer-exited.log (README.md): two CPU ranks in a gloo allreduce loop; rank 1 raises after
step 3, so rank 0's next allreduce finds its peer gone. Each rank destroys its process group on the way out."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(4)
try:
    for step in range(1, 1000):
        dist.all_reduce(tensor)
        print(f"step {step}", flush=True)
        if rank == 1 and step == 3:
            raise ValueError("rank 1 fails after step 3")
        time.sleep(0.1)
finally:
    dist.destroy_process_group()
