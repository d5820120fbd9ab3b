"""The data side: datasets -> this process's padded numpy batches. Host code, no jax.

source.py       the Source protocol, DataSettings (the typed settings it reads),
                SOURCES (dataset.name -> source), make_source (Settings) and open_source
synthetic.py    SyntheticSource: random audio and text, a function of (seed, index)
tfds_source.py  TfdsSource: LibriSpeech from tfds array_record files
split_index.py  a split's per-utterance samples and labels, and their .npz cache
filters.py      which utterances are used (duration bounds, CTC feasibility)
plan.py         duration buckets and each epoch's batch order, from (seed, epoch, lengths)
batch.py        the batch format, Sharding over processes, padding
loader.py       batches made in grain worker processes; the input-wait meter
"""
