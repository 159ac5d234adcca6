"""Legacy mixed precision, written for a CUDA machine, run on a CPU one.

torch.cuda.amp warns at every step (FutureWarning), CUDA autocast and the
scaler warn that there is no CUDA (UserWarning), and a torch.device given
as autocast's device type raises a ValueError.
"""

import hashlib

import torch
from torch import nn
from torch.cuda.amp import GradScaler


class Square(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @torch.cuda.amp.custom_bwd
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


@torch.cuda.amp.autocast()
def predict(model, x):
    return model(x)


def main():
    torch.manual_seed(0)
    device = torch.device("cpu")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = GradScaler(2.0 ** 10)  # positional: init_scale
    h = hashlib.sha256()
    for _step in range(4):
        x = torch.rand(32, 8)
        with torch.cuda.amp.autocast():
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        with torch.cuda.amp.autocast(False):  # positional: enabled
            h.update(Square.apply(model(x)).detach().numpy().tobytes())
        with torch.cpu.amp.autocast(dtype=torch.bfloat16):
            h.update(model(x).float().detach().numpy().tobytes())
        with torch.autocast(device, dtype=torch.bfloat16):
            h.update(model(x).float().detach().numpy().tobytes())
        h.update(predict(model, x).detach().numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
