"""Modern mixed precision on CPU: torch.autocast('cpu', dtype=torch.bfloat16) with
torch.amp.GradScaler('cpu'), a few training steps of a small model."""

import torch

from _common import digest_of, finish, fingerprint, record_warnings, seed_all, state


def cpu_autocast_enabled():
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch 2.0: no device argument, a function per device
        return torch.is_autocast_cpu_enabled()


def main():
    record_warnings()
    seed_all(14)
    # torch.amp.GradScaler is torch 2.3's: a script for an older torch does without
    # it (asking for it there is what AMP506 acts on: not a healthy script's call)
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 3):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    else:
        state("gradscaler_cpu", "unavailable: torch %s" % torch.__version__)
        scaler = None
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    y = torch.randn(32, 4)
    dtypes = []
    for _ in range(4):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            dtypes.append(str(out.dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
    state("autocast_dtypes", sorted(set(dtypes)))
    state("autocast_enabled_after", cpu_autocast_enabled())
    if scaler is not None:
        state("scale", scaler.get_scale())
        state("scaler_enabled", scaler.is_enabled())
    print("BATCHES", digest_of([p.detach() for p in model.parameters()]), flush=True)
    state("loss", fingerprint(round(float(loss.detach()), 6)))
    finish()


if __name__ == "__main__":
    main()
