"""Attention masks between Python and the C++ planner: the same forms as
`knapformer plan`'s JSON ("full", "causal", {"window": W},
{"spans": [[n, "full"|"causal"], ...]}), carried as JSON text so that one
parser (planner/mask_json.h) checks them and names the bad field."""

import json
import operator


def _plain(value):
    # numpy and torch integers (anything with __index__) stand for ints.
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"a {type(value).__name__} is not part of a mask form") from None


def to_json(attn_masks):
    """(JSON text or None, error message or ""): None stays None."""
    if attn_masks is None:
        return None, ""
    if isinstance(attn_masks, (str, bytes, dict)):
        return None, (f"attn_masks: needs a list with one mask per sequence, got a "
                      f"{type(attn_masks).__name__}")
    try:
        items = list(attn_masks)
    except TypeError:
        return None, (f"attn_masks: needs a list with one mask per sequence, got a "
                      f"{type(attn_masks).__name__}")
    try:
        return json.dumps(items, default=_plain), ""
    except (TypeError, ValueError) as error:
        return None, f"attn_masks: {error}"


def from_json(text):
    """The masks as Python forms; None stays None."""
    return None if text is None else json.loads(text)


def dense(length, mask):
    """[length, length] booleans, query i attends to key j, of one mask in
    the forms above (what a per-sequence attention call takes as attn_mask;
    knapformer.replay plays masks with it)."""
    import torch

    i = torch.arange(length).unsqueeze(1)
    j = torch.arange(length).unsqueeze(0)
    if mask == "full":
        return torch.ones(length, length, dtype=torch.bool)
    if mask == "causal":
        return j <= i
    if "window" in mask:
        return (j <= i) & (i - j < mask["window"])
    span = torch.cat([torch.full((n,), s) for s, (n, _) in enumerate(mask["spans"])])
    causal = torch.cat([torch.full((n,), kind == "causal") for n, kind in mask["spans"]])
    same = span.unsqueeze(1) == span.unsqueeze(0)
    return (span.unsqueeze(0) < span.unsqueeze(1)) | (same & (~causal.unsqueeze(1) | (j <= i)))
