"""Modules with the exact names and defaults of the systems croupier stands in for, on top of
croupier's own classes: :mod:`croupier.compat.kempnerforge` (kempnerforge's data package),
:mod:`croupier.compat.torchdata` (torchdata's ``StatefulDistributedSampler``),
:mod:`croupier.compat.nemo` (NeMo Automodel), :mod:`croupier.compat.transfer_queue`
(TransferQueue), :mod:`croupier.compat.megatron` (megatron-core's dataset index builders and
Megatron-LM's pretraining samplers) and
:mod:`croupier.compat.numpy` (numpy's legacy ``RandomState.shuffle``)."""
