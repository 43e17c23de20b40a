"""Train a small GPT-2 (the GPT-2 tokenizer and vocabulary) on any text file; write it in HF format.

The embedded checkpoints were made with (see models/README.md for what came out):

    python scripts/train.py --text ../shared/data/tinyshakespeare.txt --out models/tiny \
        --n-layer 4 --n-embd 128 --n-head 4 --epochs 6
    python scripts/sample_text.py --model tiny --text ../shared/data/tinyshakespeare.txt --out target_text.txt --samples 1600
    python scripts/train.py --text target_text.txt --out models/tiny-draft \
        --n-layer 2 --n-embd 32 --n-head 2 --epochs 6 --teacher tiny

The last 10% of the text is held out for validation; the checkpoint with the best validation loss is
kept. Training state is saved to OUT/train_state.pt every evaluation, and --resume continues from it.
"""

import argparse

from workshop.training import train


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", required=True, help="a UTF-8 text file to train on")
    p.add_argument("--out", required=True, help="folder to write config.json, model.safetensors, README.md")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--context", type=int, default=512, help="n_positions of the model")
    p.add_argument("--block-size", type=int, default=256, help="training sequence length (<= context)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=float, default=10, help="passes over the training tokens")
    p.add_argument("--max-steps", type=int, default=None, help="overrides --epochs")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--teacher", default=None, help="distil from this model (a name or folder for gpt.load_model), e.g. a draft from its target")
    p.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    return p.parse_args()


if __name__ == "__main__":
    train(parse_args())
