# PaTH attention from Python: PYTHONPATH=python /usr/bin/python3 examples/example.py (after building pathattn_torch).
import torch, pathattn

B, T, H, D = 2, 64, 4, 32  # q, k, v, w: [B, T, H, D]; beta: [B, T, H] in [0, 2]
q, k, v = (torch.randn(B, T, H, D, requires_grad=True) for _ in range(3))
w = torch.nn.functional.normalize(torch.randn(B, T, H, D), dim=-1)
beta = 2 * torch.rand(B, T, H)
o = pathattn.path_attention(q, k, v, w, beta)  # [B, T, H, D]
o.sum().backward()
layer = pathattn.PaTHAttention(hidden_size=128, num_heads=4, use_forget_gate=True)
print(o.shape, q.grad.norm().item(), layer(torch.randn(B, T, 128)).shape)
