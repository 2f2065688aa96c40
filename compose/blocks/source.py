"""Source text of the transformer block classes and helpers that ``compose.blocks.tasks`` writes into a task.

Each function returns the Python source of one top-level definition (a helper function or an
``nn.Module`` class) as a task holds it. The computations are written from the math of each family (the
formulas are in the docstrings of the rendered code); class and attribute names follow the transformers
class the block mirrors, so a state dict of the library module maps onto the rendered one key for key
(GPT-2's ``Conv1D`` weights, stored as (in, out), are the transposes of the ``nn.Linear`` weights here).

Sizes are constructor arguments (the task passes its module-level constants); per-family structure
(biases, activation, norm flavour) is written into the source as literals.
"""

from __future__ import annotations

# Activation name (transformers ``ACT2FN`` key) -> expression template over ``{x}``.
# gelu_new is the tanh approximation written out (GPT-2); gelu_pytorch_tanh is torch's tanh GELU (Gemma).
ACTIVATIONS = {
    "silu": "F.silu({x})",
    "swish": "F.silu({x})",
    "gelu": "F.gelu({x})",
    "gelu_pytorch_tanh": 'F.gelu({x}, approximate="tanh")',
    "gelu_new": "gelu_new({x})",
    "relu": "F.relu({x})",
}


def act(name: str, x: str) -> str:
    """The expression applying activation ``name`` to the expression ``x``. Raises KeyError for others."""
    return ACTIVATIONS[name].format(x=x)


GELU_NEW = '''def gelu_new(x):
    """GELU, tanh approximation: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))'''

ROTATE_HALF = '''def rotate_half(x):
    """Split the last dim in halves (x1, x2) and return (-x2, x1)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)'''

APPLY_ROPE = '''def apply_rotary_pos_emb(q, k, cos, sin):
    """Rotate queries and keys (batch, heads, seq, head_dim) by the position angles; cos / sin are
    (seq, head_dim) and broadcast over batch and heads."""
    q_rotated = q * cos + rotate_half(q) * sin
    k_rotated = k * cos + rotate_half(k) * sin
    return q_rotated, k_rotated'''

REPEAT_KV = '''def repeat_kv(x, n_rep):
    """Grouped-query attention: (batch, kv_heads, seq, head_dim) -> (batch, kv_heads * n_rep, seq, head_dim),
    each key / value head shared by n_rep consecutive query heads."""
    if n_rep == 1:
        return x
    batch, kv_heads, seq, head_dim = x.shape
    x = x[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, head_dim)
    return x.reshape(batch, kv_heads * n_rep, seq, head_dim)'''

SLIDING_WINDOW_MASK = '''def sliding_window_causal_mask(seq, window, device):
    """Boolean (seq, seq) mask, True where query i may attend key j: j <= i and i - j < window."""
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    return (j <= i) & (i - j < window)'''

CAUSAL_MASK = '''def causal_mask(seq, device):
    """Boolean (seq, seq) mask, True where query i may attend key j (j <= i)."""
    return torch.ones(seq, seq, dtype=torch.bool, device=device).tril()'''


def rotary_embedding(prefix: str) -> str:
    return f'''class {prefix}RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE) over the dim rotated dims of a head: angle(p, i) =
    p * theta^(-2i / dim) for position p and frequency i < dim / 2; returns cos and sin of shape (seq, dim)
    (angles repeated for both halves), computed in float32 and cast to the input dtype."""

    def __init__(self, dim, theta):
        super().__init__()
        self.dim = dim
        self.theta = theta

    def forward(self, x, seq):
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float32, device=x.device) / self.dim
        inv_freq = 1.0 / (self.theta ** exponents)
        positions = torch.arange(seq, dtype=torch.float32, device=x.device)
        angles = torch.outer(positions, inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)'''


def rms_norm(prefix: str) -> str:
    """Llama-style RMSNorm: normalise in float32, cast back, then scale."""
    return f'''class {prefix}RMSNorm(nn.Module):
    """RMSNorm: y = weight * x / sqrt(mean(x^2, last dim) + eps); the normalisation runs in float32 and is
    cast back to the input dtype before the scale."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)'''


def gemma_rms_norm(prefix: str) -> str:
    """Gemma RMSNorm: scale by (1 + weight), all in float32, cast at the end."""
    return f'''class {prefix}RMSNorm(nn.Module):
    """Gemma RMSNorm: y = x / sqrt(mean(x^2, last dim) + eps) * (1 + weight), computed in float32 and cast
    to the input dtype at the end (the weight is stored as an offset from 1)."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, hidden_states):
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * (1.0 + self.weight.float())
        return x.type_as(hidden_states)'''


def t5_layer_norm(prefix: str) -> str:
    return f'''class {prefix}LayerNorm(nn.Module):
    """T5 layer norm (an RMSNorm: no mean subtraction, no bias): y = weight * x / sqrt(mean(x^2) + eps), the
    mean of squares taken in float32; the normalised value is cast to the weight's dtype."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = (hidden_states * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)
        return self.weight * x'''


def gated_mlp(prefix: str, activation: str, bias: bool, fused: bool = False) -> str:
    """Gated MLP; ``fused``: gate and up projections in one Linear (gate_up_proj, Phi-3), split in halves."""
    gate = act(activation, "gate")
    if fused:
        return f'''class {prefix}MLP(nn.Module):
    """Gated MLP with a fused gate / up projection: gate, up = split(gate_up_proj(x)); down_proj(up * act(gate)),
    act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias={bias})
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias={bias})

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * {gate})'''
    return f'''class {prefix}MLP(nn.Module):
    """Gated MLP: down_proj(act(gate_proj(x)) * up_proj(x)), act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias={bias})
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias={bias})
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias={bias})

    def forward(self, x):
        return self.down_proj({act(activation, "self.gate_proj(x)")} * self.up_proj(x))'''


def rope_attention(prefix: str, qkv_bias: bool, o_bias: bool, qk_norm: bool, fused_qkv: bool = False) -> str:
    """Causal GQA self-attention with RoPE on (batch, heads, seq, head_dim), through SDPA. ``qk_norm``:
    per-head RMSNorm of queries and keys (Qwen3); ``fused_qkv``: one qkv_proj split into q, k, v (Phi-3)."""
    ind = "\n        "
    if fused_qkv:
        proj = (f"self.qkv_proj = nn.Linear(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, "
                f"bias={qkv_bias})")
        split = ("q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim"
                 + ind + "q, k, v = self.qkv_proj(hidden_states).split([q_size, kv_size, kv_size], dim=-1)")
        q_src, k_src, v_src = "q", "k", "v"
        proj_doc = "\n    q, k and v come from one fused projection (qkv_proj), split in this order."
    else:
        proj = ind.join(f"self.{n}_proj = nn.Linear(hidden_size, {h} * head_dim, bias={qkv_bias})"
                        for n, h in (("q", "num_heads"), ("k", "num_kv_heads"), ("v", "num_kv_heads")))
        split = ""
        q_src, k_src, v_src = (f"self.{n}_proj(hidden_states)" for n in "qkv")
        proj_doc = ""
    norm_lines, norm_apply = "", ""
    if qk_norm:
        norm_lines = (f"{ind}self.q_norm = {prefix}RMSNorm(head_dim, eps)"
                      f"{ind}self.k_norm = {prefix}RMSNorm(head_dim, eps)")
        norm_apply = f"{ind}q, k = self.q_norm(q), self.k_norm(k)"
        proj_doc += "\n    Queries and keys are RMS-normalised per head (over head_dim) before the rotation."
    eps_arg = ", eps" if qk_norm else ""
    split_line = f"{ind}{split}" if split else ""
    return f'''class {prefix}Attention(nn.Module):
    """Causal self-attention with rotary positions and grouped-query heads (num_kv_heads key / value heads
    shared by num_heads query heads): softmax(q k^T / sqrt(head_dim) + mask) v, then o_proj.{proj_doc}"""

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim{eps_arg}):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim ** -0.5
        {proj}
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias={o_bias}){norm_lines}

    def forward(self, hidden_states, cos, sin, attention_mask=None):
        """hidden_states (batch, seq, hidden); cos / sin (seq, head_dim); attention_mask: None for plain
        causal attention, else a boolean (seq, seq) mask (True = may attend)."""
        batch, seq, _ = hidden_states.shape{split_line}
        q = {q_src}.view(batch, seq, self.num_heads, self.head_dim)
        k = {k_src}.view(batch, seq, self.num_kv_heads, self.head_dim)
        v = {v_src}.view(batch, seq, self.num_kv_heads, self.head_dim){norm_apply}
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.num_heads // self.num_kv_heads)
        v = repeat_kv(v, self.num_heads // self.num_kv_heads)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=attention_mask is None,
                                             scale=self.scaling)
        out = out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o_proj(out)'''


def rope_decoder_layer(prefix: str, qk_norm: bool) -> str:
    eps_arg = ", eps" if qk_norm else ""
    return f'''class {prefix}DecoderLayer(nn.Module):
    """Pre-norm decoder layer: h = x + attn(norm1(x)); out = h + mlp(norm2(h))."""

    def __init__(self, hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim, eps):
        super().__init__()
        self.input_layernorm = {prefix}RMSNorm(hidden_size, eps)
        self.self_attn = {prefix}Attention(hidden_size, num_heads, num_kv_heads, head_dim{eps_arg})
        self.post_attention_layernorm = {prefix}RMSNorm(hidden_size, eps)
        self.mlp = {prefix}MLP(hidden_size, intermediate_size)

    def forward(self, hidden_states, cos, sin, attention_mask=None):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states), cos, sin, attention_mask)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states'''


def gpt2_mlp(prefix: str, activation: str) -> str:
    return f'''class {prefix}MLP(nn.Module):
    """MLP: c_proj(act(c_fc(x))), act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.c_fc = nn.Linear(hidden_size, intermediate_size)
        self.c_proj = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x):
        return self.c_proj({act(activation, "self.c_fc(x)")})'''


def gpt2_attention(prefix: str) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Causal multi-head self-attention with a fused q / k / v projection (c_attn) and explicit softmax:
    softmax(q k^T / sqrt(head_dim), masked above the diagonal) v, then c_proj."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.c_attn = nn.Linear(hidden_size, 3 * hidden_size)
        self.c_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(hidden, dim=2)
        q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim ** -0.5
        scores = scores.masked_fill(~causal_mask(seq, hidden_states.device), torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, hidden)
        return self.c_proj(out)'''


def gpt2_block(prefix: str) -> str:
    return f'''class {prefix}Block(nn.Module):
    """Pre-norm transformer block: h = x + attn(ln_1(x)); out = h + mlp(ln_2(h))."""

    def __init__(self, hidden_size, intermediate_size, num_heads, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_size, eps=eps)
        self.attn = {prefix}Attention(hidden_size, num_heads)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=eps)
        self.mlp = {prefix}MLP(hidden_size, intermediate_size)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states))
        return hidden_states + self.mlp(self.ln_2(hidden_states))'''


def bert_self_attention(prefix: str) -> str:
    return f'''class {prefix}SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with explicit softmax: softmax(q k^T / sqrt(head_dim)) v,
    heads concatenated back to (batch, seq, hidden) (no output projection here)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        q = self.query(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.value(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim ** -0.5
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        return torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, hidden)'''


def bert_add_norm(name: str, in_size: str) -> str:
    """BertSelfOutput / BertOutput: dense, then post-norm LayerNorm of (dense + residual)."""
    return f'''class {name}(nn.Module):
    """Projection with post-norm residual: LayerNorm(dense(x) + residual)."""

    def __init__(self, {in_size}, hidden_size, eps):
        super().__init__()
        self.dense = nn.Linear({in_size}, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, hidden_states, residual):
        return self.LayerNorm(self.dense(hidden_states) + residual)'''


def bert_attention(prefix: str) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Self-attention sub-layer, post-norm: LayerNorm(dense(self_attention(x)) + x)."""

    def __init__(self, hidden_size, num_heads, eps):
        super().__init__()
        self.self = {prefix}SelfAttention(hidden_size, num_heads)
        self.output = {prefix}SelfOutput(hidden_size, hidden_size, eps)

    def forward(self, hidden_states):
        return self.output(self.self(hidden_states), hidden_states)'''


def bert_intermediate(prefix: str, activation: str) -> str:
    return f'''class {prefix}Intermediate(nn.Module):
    """First half of the feed-forward: act(dense(x)), act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)

    def forward(self, hidden_states):
        return {act(activation, "self.dense(hidden_states)")}'''


def bert_layer(prefix: str) -> str:
    return f'''class {prefix}Layer(nn.Module):
    """Post-norm encoder layer: h = LayerNorm(x + attn(x)); out = LayerNorm(h + dense(act(dense(h))))."""

    def __init__(self, hidden_size, intermediate_size, num_heads, eps):
        super().__init__()
        self.attention = {prefix}Attention(hidden_size, num_heads, eps)
        self.intermediate = {prefix}Intermediate(hidden_size, intermediate_size)
        self.output = {prefix}Output(intermediate_size, hidden_size, eps)

    def forward(self, hidden_states):
        attention_output = self.attention(hidden_states)
        return self.output(self.intermediate(attention_output), attention_output)'''


def vit_attention(prefix: str, qkv_bias: bool) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Bidirectional multi-head self-attention with explicit softmax: softmax(q k^T / sqrt(head_dim)) v,
    then o_proj."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias={qkv_bias})
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias={qkv_bias})
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias={qkv_bias})
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        q = self.q_proj(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim ** -0.5
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, hidden)
        return self.o_proj(out)'''


def vit_mlp(prefix: str, activation: str) -> str:
    return f'''class {prefix}MLP(nn.Module):
    """MLP: fc2(act(fc1(x))), act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x):
        return self.fc2({act(activation, "self.fc1(x)")})'''


def vit_layer(prefix: str) -> str:
    return f'''class {prefix}Layer(nn.Module):
    """Pre-norm encoder layer: h = x + attn(LayerNorm(x)); out = h + mlp(LayerNorm(h))."""

    def __init__(self, hidden_size, intermediate_size, num_heads, eps):
        super().__init__()
        self.attention = {prefix}Attention(hidden_size, num_heads)
        self.layernorm_before = nn.LayerNorm(hidden_size, eps=eps)
        self.layernorm_after = nn.LayerNorm(hidden_size, eps=eps)
        self.mlp = {prefix}MLP(hidden_size, intermediate_size)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.attention(self.layernorm_before(hidden_states))
        return hidden_states + self.mlp(self.layernorm_after(hidden_states))'''


def opt_attention(prefix: str, bias: bool) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Causal multi-head self-attention with explicit softmax; queries are scaled by 1 / sqrt(head_dim)
    before the product: softmax((q / sqrt(head_dim)) k^T, masked above the diagonal) v, then out_proj."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias={bias})
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias={bias})
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias={bias})
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias={bias})

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        q = (self.q_proj(hidden_states) * self.scaling).view(batch, seq, self.num_heads, self.head_dim)
        q = q.transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores.masked_fill(~causal_mask(seq, hidden_states.device), torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, hidden)
        return self.out_proj(out)'''


def opt_decoder_layer(prefix: str, activation: str, bias: bool) -> str:
    return f'''class {prefix}DecoderLayer(nn.Module):
    """Pre-norm decoder layer: h = x + attn(LayerNorm(x)); out = h + fc2(act(fc1(LayerNorm(h)))),
    act = {activation}."""

    def __init__(self, hidden_size, intermediate_size, num_heads):
        super().__init__()
        self.self_attn = {prefix}Attention(hidden_size, num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(hidden_size)
        self.fc1 = nn.Linear(hidden_size, intermediate_size, bias={bias})
        self.fc2 = nn.Linear(intermediate_size, hidden_size, bias={bias})
        self.final_layer_norm = nn.LayerNorm(hidden_size)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attn(self.self_attn_layer_norm(hidden_states))
        x = self.final_layer_norm(hidden_states)
        return hidden_states + self.fc2({act(activation, "self.fc1(x)")})'''


def t5_dense_act_dense(prefix: str, activation: str) -> str:
    return f'''class {prefix}DenseActDense(nn.Module):
    """Feed-forward without biases: wo(act(wi(x))), act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.wi = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.wo = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.wo({act(activation, "self.wi(x)")})'''


def t5_layer_ff(prefix: str) -> str:
    return f'''class {prefix}LayerFF(nn.Module):
    """Pre-norm feed-forward sub-layer: x + DenseReluDense(layer_norm(x))."""

    def __init__(self, hidden_size, intermediate_size, eps):
        super().__init__()
        self.DenseReluDense = {prefix}DenseActDense(hidden_size, intermediate_size)
        self.layer_norm = {prefix}LayerNorm(hidden_size, eps)

    def forward(self, hidden_states):
        return hidden_states + self.DenseReluDense(self.layer_norm(hidden_states))'''


def init_norms(norm_classes: list[str], offset_weight: bool) -> str:
    """The helper that gives every norm trained-like, seeded parameters (so no norm is an identity)."""
    classes = ", ".join(norm_classes) + ("," if len(norm_classes) == 1 else "")
    scale = "0.1 * torch.randn(module.weight.shape, generator=gen, device=\"cpu\")"
    if not offset_weight:
        scale = "1 + " + scale
    offset = "\n    (the weight holds the scale's offset from 1)" if offset_weight else ""
    return f'''def init_norm_parameters(model, seed):
    """Trained-like norm parameters, drawn from a CPU generator seeded with seed so that no norm is an
    identity: norm scale 1 + 0.1 * N(0, 1), norm bias 0.1 * N(0, 1).{offset}"""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ({classes})):
                module.weight.copy_({scale})
                if getattr(module, "bias", None) is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen, device="cpu"))'''


APPLY_PARTIAL_ROPE = '''def apply_rotary_pos_emb(q, k, cos, sin):
    """Rotate the first rotary_dim = cos.shape[-1] dims of each query / key head (batch, heads, seq,
    head_dim) by the position angles; the remaining dims pass through unchanged."""
    rot = cos.shape[-1]
    q_rotated = q[..., :rot] * cos + rotate_half(q[..., :rot]) * sin
    k_rotated = k[..., :rot] * cos + rotate_half(k[..., :rot]) * sin
    return torch.cat((q_rotated, q[..., rot:]), dim=-1), torch.cat((k_rotated, k[..., rot:]), dim=-1)'''


def neox_mlp(prefix: str, activation: str, bias: bool = True) -> str:
    """GPT-NeoX / Falcon MLP (Falcon's projections are unbiased)."""
    return f'''class {prefix}MLP(nn.Module):
    """MLP: dense_4h_to_h(act(dense_h_to_4h(x))), act = {activation}."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(hidden_size, intermediate_size, bias={bias})
        self.dense_4h_to_h = nn.Linear(intermediate_size, hidden_size, bias={bias})

    def forward(self, x):
        return self.dense_4h_to_h({act(activation, "self.dense_h_to_4h(x)")})'''


def neox_attention(prefix: str, bias: bool) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Causal multi-head self-attention with partial rotary positions, through SDPA. One fused projection
    (query_key_value) gives per head a block of 3 * head_dim features: [q | k | v]."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size, bias={bias})
        self.dense = nn.Linear(hidden_size, hidden_size, bias={bias})

    def forward(self, hidden_states, cos, sin):
        """hidden_states (batch, seq, hidden); cos / sin (seq, rotary_dim)."""
        batch, seq, hidden = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(batch, seq, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.transpose(1, 2).chunk(3, dim=-1)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim ** -0.5)
        return self.dense(out.transpose(1, 2).reshape(batch, seq, hidden))'''


def neox_layer(prefix: str, parallel: bool) -> str:
    if parallel:
        doc = "Parallel-residual decoder layer: out = x + attn(LayerNorm(x)) + mlp(LayerNorm'(x))."
        body = '''        attn_out = self.attention(self.input_layernorm(hidden_states), cos, sin)
        mlp_out = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + attn_out + mlp_out'''
    else:
        doc = "Pre-norm decoder layer: h = x + attn(LayerNorm(x)); out = h + mlp(LayerNorm'(h))."
        body = '''        hidden_states = hidden_states + self.attention(self.input_layernorm(hidden_states), cos, sin)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))'''
    return f'''class {prefix}Layer(nn.Module):
    """{doc}"""

    def __init__(self, hidden_size, intermediate_size, num_heads, eps):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden_size, eps=eps)
        self.post_attention_layernorm = nn.LayerNorm(hidden_size, eps=eps)
        self.attention = {prefix}Attention(hidden_size, num_heads)
        self.mlp = {prefix}MLP(hidden_size, intermediate_size)

    def forward(self, hidden_states, cos, sin):
{body}'''


def falcon_attention(prefix: str, bias: bool) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Causal multi-query self-attention with rotary positions, through SDPA. One fused projection
    (query_key_value) gives num_heads query heads followed by one key head and one value head, shared by
    every query head."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.query_key_value = nn.Linear(hidden_size, hidden_size + 2 * self.head_dim, bias={bias})
        self.dense = nn.Linear(hidden_size, hidden_size, bias={bias})

    def forward(self, hidden_states, cos, sin):
        """hidden_states (batch, seq, hidden); cos / sin (seq, head_dim)."""
        batch, seq, hidden = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(batch, seq, self.num_heads + 2, self.head_dim)
        q, k, v = qkv[:, :, :-2], qkv[:, :, -2:-1], qkv[:, :, -1:]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, self.num_heads), repeat_kv(v, self.num_heads)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim ** -0.5)
        return self.dense(out.transpose(1, 2).reshape(batch, seq, hidden))'''


def falcon_decoder_layer(prefix: str) -> str:
    return f'''class {prefix}DecoderLayer(nn.Module):
    """Parallel attention / MLP decoder layer sharing one LayerNorm:
    out = x + attn(LayerNorm(x)) + mlp(LayerNorm(x))."""

    def __init__(self, hidden_size, intermediate_size, num_heads, eps):
        super().__init__()
        self.self_attention = {prefix}Attention(hidden_size, num_heads)
        self.mlp = {prefix}MLP(hidden_size, intermediate_size)
        self.input_layernorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, hidden_states, cos, sin):
        x = self.input_layernorm(hidden_states)
        return hidden_states + self.self_attention(x, cos, sin) + self.mlp(x)'''


RELATIVE_POSITION_BUCKET = '''def relative_position_bucket(relative_position, num_buckets, max_distance):
    """Bidirectional T5 bucket of each relative position (key index - query index): half of the buckets per
    direction; within a half, distances below a quarter of num_buckets get a bucket each, larger ones share
    log-spaced buckets up to max_distance, and all farther ones fall in the half's last bucket."""
    num_buckets //= 2
    buckets = (relative_position > 0).to(torch.long) * num_buckets
    distance = relative_position.abs()
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)'''


def t5_attention(prefix: str) -> str:
    return f'''class {prefix}Attention(nn.Module):
    """Bidirectional multi-head self-attention with a learned relative position bias (one scalar per head
    and relative-position bucket) added to the unscaled scores: softmax(q k^T + bias) v, then o."""

    def __init__(self, hidden_size, num_heads, head_dim, num_buckets, max_distance):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.q = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.o = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    def forward(self, hidden_states):
        batch, seq, _ = hidden_states.shape
        q = self.q(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v(hidden_states).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        positions = torch.arange(seq, device=hidden_states.device)
        relative = positions[None, :] - positions[:, None]  # (query, key): key index - query index
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
        bias = self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, heads, seq, seq)
        scores = torch.matmul(q, k.transpose(-1, -2)) + bias
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o(out)'''


def t5_block(prefix: str) -> str:
    return f'''class {prefix}LayerSelfAttention(nn.Module):
    """Pre-norm self-attention sub-layer: x + SelfAttention(layer_norm(x))."""

    def __init__(self, hidden_size, num_heads, head_dim, num_buckets, max_distance, eps):
        super().__init__()
        self.SelfAttention = {prefix}Attention(hidden_size, num_heads, head_dim, num_buckets, max_distance)
        self.layer_norm = {prefix}LayerNorm(hidden_size, eps)

    def forward(self, hidden_states):
        return hidden_states + self.SelfAttention(self.layer_norm(hidden_states))


class {prefix}Block(nn.Module):
    """Pre-norm encoder block: the self-attention sub-layer, then the feed-forward sub-layer."""

    def __init__(self, hidden_size, intermediate_size, num_heads, head_dim, num_buckets, max_distance, eps):
        super().__init__()
        self.layer = nn.ModuleList([
            {prefix}LayerSelfAttention(hidden_size, num_heads, head_dim, num_buckets, max_distance, eps),
            {prefix}LayerFF(hidden_size, intermediate_size, eps),
        ])

    def forward(self, hidden_states):
        hidden_states = self.layer[0](hidden_states)
        return self.layer[1](hidden_states)'''
