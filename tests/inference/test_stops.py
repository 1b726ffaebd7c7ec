"""The one stop rule (inference.stops): EOS ids of the tokenizer and generation config plus the chat end-of-turn
tokens the vocabulary has, used by every engine that ``make_sampler`` builds."""

from inference import make_sampler
from inference.stops import stop_ids
from inference.tiny import build_model, build_tokenizer


class _GC:
    eos_token_id = [151643, 7]


class _Model:
    generation_config = _GC()


class _Tok:
    eos_token_id = 151643

    def get_vocab(self):
        return {"<|endoftext|>": 151643, "<|im_end|>": 151645, "a": 1}


def test_stop_ids_add_end_of_turn_tokens():
    assert stop_ids(_Model(), _Tok()) == [151643, 7, 151645]


def test_make_sampler_stops_at_end_of_turn_tokens_the_vocabulary_has():
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=0)
    assert make_sampler(model, tok, engine="hf").eos_token_ids == [tok.eos_token_id]   # no chat tokens: EOS alone
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert make_sampler(model, tok, engine="hf").eos_token_ids == [tok.eos_token_id, im_end]
