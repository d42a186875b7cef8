"""DPO as the paper writes it, on the policy's full logits."""
import torch
import torch.nn.functional as F


def dpo_paper(logits, labels, mask, ref_logps, beta: float = 0.1):
    logp = F.log_softmax(logits.float() / 0.9, dim=-1)
    tok = torch.gather(logp, -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    seq = (tok * mask).sum(-1)
    chosen, rejected = seq.chunk(2)
    ref_c, ref_r = ref_logps.chunk(2)
    return -F.logsigmoid(beta * ((chosen - ref_c) - (rejected - ref_r))).mean()


def get_inputs():
    labels = torch.randint(0, 37, (4, 11))
    mask = (torch.rand(4, 11) > 0.3).float()
    return [torch.randn(4, 11, 37), labels, mask, torch.randn(4) * 3]
