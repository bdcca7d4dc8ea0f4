"""placeholder"""
def diffusers_entries():
    return []
