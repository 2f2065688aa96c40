"""Sampling head: x (no temperature) -> top-p (p=0.19999999999999996) mask -> softmax, float32 [512, 51200], without a
sort (kernels/topp_softmax.cu).

One block of 1024 threads per row; the row (about 200 KB) is read once into shared memory. Row max, e = exp(v - max)
in place and Z = sum(e); the top-p cut is found without sorting: a token is dropped iff the mass of the tokens up to
and including it is <= p * Z, so the cut is the largest T with sum(e : bits(e) < T) <= p * Z, found by bisection
over the float bits of e (block reductions, early exit once one token is left in the interval), run only over the
tokens above p * Z / V (the rest are dropped for certain), compacted into the spare shared memory. The kept mass
then normalises the output, written once with 16-byte stores. HBM traffic: x read once, out written once (8 B /
element, roofline_ms 0.0437); the bisection runs from shared memory: predicted 3-4x roofline, far under compile_ms
2.54."""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return opforge_kernels.topp_softmax(x.contiguous(), 0.19999999999999996, 1.0)
