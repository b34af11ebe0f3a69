import torch, torch.nn.functional as F
def f(g, u):
    return F.silu(g) * u
c = torch.compile(f, dynamic=False)
g = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
u = torch.randn_like(g, requires_grad=True)
y = c(g, u)
torch.autograd.grad(y, (g, u), torch.randn_like(y))
