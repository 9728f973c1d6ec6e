"""Source text of test models that more than one test writes into a package of its own (a
user's `package.module:Callable`), so that each package is importable as a user's code is."""

ATTENTION = '''
class Attention(nn.Module):
    """Patches through nn.MultiheadAttention, as in ViT: in eval mode under no_grad it takes
    a fast path (aten::_native_multi_head_attention) that ONNX cannot express."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(3, 8, 4, stride=4)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        mixed, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        return self.head(mixed.mean(1))
'''
