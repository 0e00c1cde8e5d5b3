"""Build the fake engines' tokenizer files into ``fake_engines/data/`` (run once; the output is committed).

    python -m fake_engines.build_tokenizer [--out DIR] [--vocab-size N]

Byte-level BPE trained on a small embedded English corpus, so any text round-trips losslessly and ordinary
words are single tokens (the generator draws its output from those word tokens).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from fake_engines.core.chat import CHAT_TEMPLATE
from fake_engines.core.tokenizer import BOS_TOKEN, EOS_TOKEN, SPECIAL_TOKENS, data_dir

VOCAB_SIZE = 3000
MODEL_NAME = "pdchaos-fake"

_PARAGRAPHS = """
The harness starts a small cluster on one machine. A router sits in front of two kinds of engines: the
prefill engines read the whole prompt and build the key value cache, and the decode engines write the
answer one token at a time. Between the two, the cache moves over a side channel. When everything works,
nobody notices the handoff. When something breaks, a request may wait for minutes, or the answer may come
from the wrong cache.

Every morning the weather station sends a short report. Today the sky was clear over the hills, the wind
came from the north, and the river was higher than last week because of the rain. Farmers in the valley
said the harvest would be early this year. Children walked to school along the old road near the bridge,
and the market opened at eight with fresh bread, apples, cheese and flowers.

Good software is written for people first and machines second. Small functions with one job are easy to
read, easy to test and easy to change. A test that cannot fail tells you nothing. A timeout on every
network call keeps one slow server from stalling the whole system. Logs should say what happened, when it
happened and why it mattered, so that the person reading them at night can fix the problem and go back to
sleep.

She opened the window and looked at the garden. The roses were in bloom, the grass needed cutting, and a
small bird was building a nest in the apple tree. He brought two cups of coffee from the kitchen, and
they sat together on the bench, talking about the journey they planned for the summer: a train to the
coast, a boat to the islands, and a long walk through the forest to the lighthouse at the end of the
world.

History shows that cities grow near water. Ports bring trade, trade brings money, and money builds
schools, hospitals, libraries and theatres. Over many centuries the streets changed from mud to stone,
from stone to asphalt, and the carts became cars and buses. Yet the people still meet in the square, buy
food at the market, and tell each other stories about the past and their hopes for the future.

A healthy service answers its health check quickly. When an engine restarts, it gets a new identity, and
the router must learn the new engine id before it sends more traffic. If the router keeps the old id, the
decode engine asks for a cache that no longer exists, and the request hangs until the transfer timeout
expires. The chaos test injects that restart on purpose, measures how long recovery takes, and reports
whether every request ended with a correct answer or a clear error before its deadline.
"""

_WORDS = """
a about above across act action add after again against age ago agree air all allow almost alone along
already also although always am among amount an and animal another answer any appear apple area arm
around arrive art as ask at away baby back bad bag ball bank base be bear beat beautiful became because
become bed been before begin behind being believe below best better between big bird black blood blue
board boat body book born both bottom box boy bread break bright bring brother brown build burn business
but buy by call came can capital car care carry case cat catch cause cell center century certain chair
chance change character check child choose church circle city class clean clear close cloud coast cold
color come common company complete condition consider contain continue control cook cool copy corn corner
correct cost could count country course cover cow create cross crowd cry current cut dance dark day dead
deal dear death decide deep degree depend describe desert design determine develop did die difference
different difficult dinner direct discover distance divide do doctor does dog dollar done door double
down draw dream dress drink drive drop dry during each ear early earth east easy eat edge effect egg
eight either electric element else end enemy energy engine enough enter equal even evening event ever
every exact example except excite exercise expect experience explain eye face fact fair fall family
famous far farm fast father favor fear feel feet fell felt few field fig fight figure fill final find
fine finger finish fire first fish five floor flow flower fly follow food foot for force forest form
forward found four free fresh friend from front fruit full fun game garden gas gather gave general gentle
get girl give glad glass go gold gone good got govern grand grass gray great green ground group grow
guess guide had hair half hand happen happy hard has hat have he head hear heard heart heat heavy held
help her here high hill him his history hold hole home hope horse hot hour house how huge human hundred
hunt hurry ice idea if imagine important in inch include indicate industry inside instead interest iron
island it job join joy jump just keep kept key kind king kitchen knew know lady lake land language large
last late laugh law lay lead learn least leave left leg length less letter level lie life lift light like
line liquid list listen little live long look lost lot loud love low machine made magnet main major make
man many map mark market mass master match material matter may me mean measure meat meet melody member
memory men metal method middle might mile milk million mind mine minute miss modern moment money month
moon more morning most mother motion mountain mouth move much music must my name nation natural nature
near necessary neck need neighbor never new next night nine no noise noon nor north nose note nothing
notice noun now number object observe ocean of off offer office often oil old on once one only open
operate opposite or order organ original other our out over own oxygen page paint pair paper paragraph
parent part particular party pass past path pattern pay people perhaps period person picture piece place
plain plan planet plant play please plural poem point pole poor popular position possible pound power
practice prepare present press pretty print probable problem process produce product proper property
protect prove provide pull push put quart question quick quiet quite race radio rain raise ran range
rather reach read ready real reason receive record region remember repeat reply report rest result return
rich ride right ring rise river road rock roll room root rope rose round row rub rule run safe said sail
salt same sand sat save saw say scale school science score sea search season seat second section see seed
seem segment select self sell send sense sentence separate serve set settle seven several shall shape
share sharp she sheet shell shine ship shoe shop shore short should shoulder shout show side sight sign
silent silver similar simple since sing single sister sit six size skill skin sky sleep slip slow small
smell smile snow so soft soil soldier solution solve some son song soon sound south space speak special
speech speed spell spend spoke spot spread spring square stand star start state station stay steam steel
step stick still stone stood stop store storm story straight strange stream street stretch string strong
student study subject substance success such sudden suffix sugar suggest suit summer sun supply support
sure surface surprise swim syllable symbol system table tail take talk tall teach team teeth tell
temperature ten term test than thank that the their them then there these they thick thin thing think
third this those though thought thousand three through throw thus tie time tiny tire to together told
tone too took tool top total touch toward town track trade train travel tree triangle trip trouble truck
true try tube turn twenty two type under unit until up upon us use usual valley value vary verb very view
village visit voice vowel wait walk wall want war warm was wash watch water wave way we wear weather week
weight well went were west what wheel when where whether which while white who whole whose why wide wife
wild will win wind window winter wire wish with woman women wonder wood word work world would write
written wrong yard year yellow yes yet you young your
"""


def corpus() -> list[str]:
    """Training texts: the paragraphs, each word alone, and words in running text (with a leading space)."""
    words = _WORDS.split()
    lines = [p.strip() for p in _PARAGRAPHS.split("\n\n") if p.strip()]
    lines += [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    lines += [w.capitalize() + "." for w in words]
    # tags and chat markers appear in every prompt the harness sends
    lines += [f"[pdchaos:run{i}:{i}] Tell me about the {w}." for i, w in enumerate(words[:50])]
    return lines


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus() * 3, trainer=trainer)
    return tok


def write_files(out: Path, vocab_size: int = VOCAB_SIZE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    eos_id = tok.token_to_id(EOS_TOKEN)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "_name_or_path": MODEL_NAME,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    for name, obj in (("tokenizer_config.json", tokenizer_config), ("config.json", config)):
        (out / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=data_dir())
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    write_files(args.out, args.vocab_size)
    print(f"wrote tokenizer files to {args.out}")


if __name__ == "__main__":
    main()
