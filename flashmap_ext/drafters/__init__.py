"""The drafters: common/ (what they share), flashmap/ (the flow-map drafter), dflash/ and eagle3/ (baselines),
load.py (`load_drafter`: a checkpoint directory dispatched on its config.json, or a random drafter)."""
