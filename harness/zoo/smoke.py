"""The smoke zoo: a fixed list of ids, one to three per task family of both libraries, chosen among
well-known architectures whose CPU baseline passes, so a smoke sweep measures the backend and not the zoo.
Every task family of the full zoo is covered except those listed in UNCOVERED_TASKS (no entry of theirs
runs on the CPU baseline yet)."""

SMOKE_IDS: list[str] = [
    # text
    "transformers/llama/LlamaForCausalLM",
    "transformers/gpt2/GPT2LMHeadModel",
    "transformers/qwen2/Qwen2ForCausalLM",
    "transformers/bert/BertForMaskedLM",
    "transformers/roberta/RobertaForMaskedLM",
    "transformers/t5/T5ForConditionalGeneration",
    "transformers/bart/BartForConditionalGeneration",
    "transformers/bert/BertForSequenceClassification",
    "transformers/llama/LlamaForSequenceClassification",
    "transformers/llama/LlamaForTokenClassification",
    "transformers/llama/LlamaForQuestionAnswering",
    "transformers/bert/BertForMultipleChoice",
    "transformers/bert/BertForNextSentencePrediction",
    "transformers/bert/BertForPreTraining",
    "transformers/bert/BertModel",
    "transformers/llama/LlamaModel",
    # vision
    "transformers/vit/ViTForImageClassification",
    "transformers/convnext/ConvNextForImageClassification",
    "transformers/vit/ViTModel",
    "transformers/swin/SwinBackbone",
    "transformers/vit/ViTForMaskedImageModeling",
    "transformers/segformer/SegformerForSemanticSegmentation",
    "transformers/dpt/DPTForDepthEstimation",
    "transformers/yolos/YolosForObjectDetection",
    "transformers/superpoint/SuperPointForKeypointDetection",
    "transformers/vitmatte/VitMatteForImageMatting",
    "transformers/videomae/VideoMAEForVideoClassification",
    "transformers/clip/CLIPModel",
    # audio
    "transformers/whisper/WhisperForConditionalGeneration",
    "transformers/speecht5/SpeechT5ForSpeechToText",
    "transformers/wav2vec2/Wav2Vec2ForCTC",
    "transformers/wav2vec2/Wav2Vec2ForSequenceClassification",
    "transformers/whisper/WhisperForAudioClassification",
    "transformers/higgs_audio_v2/HiggsAudioV2ForConditionalGeneration",
    # multimodal, time series
    "transformers/paligemma/PaliGemmaForConditionalGeneration",
    "transformers/qwen2_vl/Qwen2VLForConditionalGeneration",
    "transformers/blip/BlipForConditionalGeneration",
    "transformers/patchtst/PatchTSTForClassification",
    # diffusers models
    "diffusers/UNet2DModel",
    "diffusers/UNet2DConditionModel",
    "diffusers/AutoencoderKL",
    "diffusers/AutoencoderTiny",
    "diffusers/DiTTransformer2DModel",
    "diffusers/FluxTransformer2DModel",
    "diffusers/SD3Transformer2DModel",
    "diffusers/ControlNetModel",
    "diffusers/T2IAdapter",
    # diffusers pipelines
    "diffusers/pipeline/StableDiffusionPipeline",
    "diffusers/pipeline/DDPMPipeline",
]

# Task families with no smoke entry, and why (see `hf-tpu zoo check --task ...`).
UNCOVERED_TASKS: dict[str, str] = {
    "reinforcement-learning": "JevForDecision entries do not build from shrunk configs yet",
}
