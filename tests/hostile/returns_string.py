"""Returns a string instead of (model, inputs)."""


def get_model_and_input():
    return "model.pt"
