"""One window's decoding: the tokenizer (`tokenizer`), prompts and suppressed ids
(`prompts`), DecodeOptions, the logit rules and the greedy decode with temperature fallback
(`decoding`), their checks (`options`), beam search (`beams`), the batcher that runs
concurrent decodes' steps as one forward (`step_batcher`), and what decoding hands out
(`results`: TokenEvent, Segment, Transcript...).

May import: xattn.model.audio, xattn.model.net, xattn.model.checkpoints.
"""
